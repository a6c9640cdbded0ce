"""A notebook whose kernel loses a request or a reply fails at once, with a message that says
which, instead of waiting out the cell timeout (tests/kernel_watchdog.py); and the client
sends nothing on the shell channel while it waits for a reply there, which is how replies got
lost (``d2l_multi.commands.book.keep_widget_output_in_cells``)."""
import time

import kernel_watchdog
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

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
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3")
    try:
        client.execute()
    finally:
        run.seconds = time.monotonic() - start
    return nb, client


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


def test_widget_output_stays_in_the_cell_and_the_client_sends_nothing_while_waiting():
    """nbclient mimics a browser's Output widget by messaging the kernel on the shell channel
    while it awaits the cell's reply there; pyzmq could then miss the reply's arrival and the
    cell hung. The test session, like the book build, turns the mimic off: no widget object
    on the client's side, and ``interact``'s printout is an ordinary output of its cell."""
    nb, client = run("from ipywidgets import interact\n"
                     "interact(lambda n: print(f'n is {n}'), n=(1, 9));")
    assert client.comm_objects == {}
    printed = [o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream"]
    assert "n is 5\n" in printed
