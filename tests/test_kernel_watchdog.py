"""A notebook whose kernel loses a request or a reply fails at once, with a message that says
which, instead of waiting out the cell timeout (tests/kernel_watchdog.py)."""
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

import kernel_watchdog

LOSE_NEXT_REQUEST = """\
k = get_ipython().kernel
handle = k.dispatch_shell
async def lose_one(msg, **kwargs):
    k.dispatch_shell = handle          # the next request is dropped unread
k.dispatch_shell = lose_one"""

LOSE_THIS_REPLY = """\
k = get_ipython().kernel
send = k.session.send
def drop_reply(stream, msg_type, *args, **kwargs):
    if msg_type != "execute_reply":
        return send(stream, msg_type, *args, **kwargs)
    k.session.send = send              # this cell's reply is never sent
    return {"content": {"status": "ok"}}
k.session.send = drop_reply"""


def run(*cells, timeout=600):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    start = time.monotonic()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3").execute()
    finally:
        run.seconds = time.monotonic() - start


@pytest.fixture
def short_graces(monkeypatch):
    monkeypatch.setattr(kernel_watchdog, "REQUEST_GRACE", 5.0)
    monkeypatch.setattr(kernel_watchdog, "REPLY_GRACE", 5.0)


def test_a_lost_request_fails_the_cell_at_once(short_graces):
    with pytest.raises(CellTimeoutError, match="never started this cell"):
        run(LOSE_NEXT_REQUEST, "print('never run')")
    assert run.seconds < 300                          # not the 600 s cell timeout


def test_a_lost_reply_fails_the_cell_at_once(short_graces):
    with pytest.raises(CellTimeoutError, match="execute_reply did not arrive"):
        run("x = 1", LOSE_THIS_REPLY, "print(x)")
    assert run.seconds < 300


def test_a_slow_cell_is_left_to_the_cell_timeout(short_graces):
    run("import time\ntime.sleep(8)\nprint('done')")  # busy for longer than the graces
