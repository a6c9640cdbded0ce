"""A tiny next-token task bundled with the package (no download): character windows of a short
public-domain text."""
from collections.abc import Iterable, Iterator

import numpy as np

from . import _checks as check
from .errors import InputError
from .smoke_switch import shrink

TINY_TEXT = (  # Lewis Carroll, Alice's Adventures in Wonderland (1865), public domain
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of "
    "having nothing to do: once or twice she had peeped into the book her sister was reading, "
    "but it had no pictures or conversations in it, 'and what is the use of a book,' thought "
    "Alice 'without pictures or conversations?' So she was considering in her own mind (as "
    "well as she could, for the hot day made her feel very sleepy and stupid), whether the "
    "pleasure of making a daisy-chain would be worth the trouble of getting up and picking the "
    "daisies, when suddenly a White Rabbit with pink eyes ran close by her. There was nothing "
    "so very remarkable in that; nor did Alice think it so very much out of the way to hear "
    "the Rabbit say to itself, 'Oh dear! Oh dear! I shall be late!' (when she thought it over "
    "afterwards, it occurred to her that she ought to have wondered at this, but at the time "
    "it all seemed quite natural); but when the Rabbit actually took a watch out of its "
    "waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for "
    "it flashed across her mind that she had never before seen a rabbit with either a "
    "waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran "
    "across the field after it, and fortunately was just in time to see it pop down a large "
    "rabbit-hole under the hedge.")


class CharCorpus:
    """Character-level language modelling on ``text``: batches of random windows, the targets
    shifted one character to the right. The vocabulary is padded to a multiple of
    ``vocab_multiple`` so that it splits evenly over a mesh axis."""

    def __init__(self, batch_size: int = 16, seq_len: int = 32, text: str = TINY_TEXT,
                 vocab_multiple: int = 8, seed: int = 0) -> None:
        check.integer(1, batch_size=batch_size, seq_len=seq_len, vocab_multiple=vocab_multiple)
        check.integer(0, seed=seed)
        if not isinstance(text, str):
            raise InputError(f"text must be a str, got {type(text).__name__}")
        if len(text) <= seq_len + 1:
            raise InputError(f"the text has {len(text)} characters, too few for windows of "
                             f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more text")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.vocab = sorted(set(text))
        self.vocab_size = -(-len(self.vocab) // vocab_multiple) * vocab_multiple
        self.tokens = self.encode(text)

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``'s characters (each must be in the vocabulary)."""
        unknown = sorted(set(text) - set(self.vocab))
        if unknown:
            raise InputError(f"text holds characters outside the vocabulary: {unknown[:5]}; "
                             f"encode text made of the corpus's characters")
        index = {c: i for i, c in enumerate(self.vocab)}
        return np.array([index[c] for c in text], dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.vocab[i] if i < len(self.vocab) else "?" for i in np.asarray(ids))

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch number ``step`` (the same every time): inputs X and targets Y, each
        (batch_size, seq_len) int32."""
        check.integer(0, step=step)
        rng = np.random.default_rng((self.seed, step))
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, self.batch_size)
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts])
        return windows[:, :-1], windows[:, 1:]

    def batches(self, num_batches: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The batches number 0, 1, ..., ``num_batches`` - 1 (at most 10 with the smoke
        switch on)."""
        check.positive(num_batches=num_batches)
        for step in range(shrink(num_batches, 10)):
            yield self.batch(step)
