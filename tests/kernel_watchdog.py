"""A notebook run finishes or fails with a message; it never waits out the cell timeout for a
message the kernel lost.

nbclient (which nbmake drives) sends a cell as an ``execute_request`` and waits for the
``execute_reply`` on the shell channel, up to the cell timeout (15 minutes here). The kernel
also reports on the IOPub channel: ``busy`` when it takes the request, ``idle`` when it is done.
A kernel can lose either end of that exchange: ipykernel 7 could leave a request unread in its
shell socket, the kernel idle and the client waiting (ipython/ipykernel#1554, fixed by #1529),
and a reply can go missing the same way. Both states are visible on IOPub, so this watchdog
fails the cell at once instead of waiting:

* no ``busy`` within ``REQUEST_GRACE`` seconds of the request: the kernel never read it;
* ``idle`` but no reply within ``REPLY_GRACE`` seconds: the kernel finished, the reply is lost.

A cell that is still running (``busy``, not yet ``idle``) is left to the cell timeout.
"""
import asyncio
import time

from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError

REQUEST_GRACE, REPLY_GRACE = 120.0, 60.0
_poll_for_reply = NotebookClient._async_poll_for_reply
_process_message = NotebookClient.process_message


def _process(self, msg, cell, cell_index):
    content, parent = msg.get("content", {}), msg.get("parent_header", {})
    if msg.get("msg_type") == "status" and content.get("execution_state") == "busy":
        self.__dict__.setdefault("_busy", set()).add(parent.get("msg_id"))
    return _process_message(self, msg, cell, cell_index)


async def _watch(self, msg_id, cell, output_task):
    sent = time.monotonic()
    while not output_task.done():
        if msg_id not in self.__dict__.get("_busy", ()) and (
                time.monotonic() - sent > REQUEST_GRACE):
            raise CellTimeoutError.error_from_timeout_and_cell(
                f"The kernel never started this cell: no 'busy' status within "
                f"{REQUEST_GRACE:.0f} s of the request, although it was idle. The kernel lost "
                f"the execute_request", REQUEST_GRACE, cell)
        await asyncio.sleep(1.0)
    await asyncio.sleep(REPLY_GRACE)
    raise CellTimeoutError.error_from_timeout_and_cell(
        f"The kernel finished this cell (status 'idle') but its execute_reply did not arrive "
        f"within {REPLY_GRACE:.0f} s. The kernel lost the reply", REPLY_GRACE, cell)


async def _poll_with_watchdog(self, msg_id, cell, timeout, task_poll_output_msg,
                              task_poll_kernel_alive):
    reply = asyncio.ensure_future(_poll_for_reply(self, msg_id, cell, timeout,
                                                  task_poll_output_msg, task_poll_kernel_alive))
    watch = asyncio.ensure_future(_watch(self, msg_id, cell, task_poll_output_msg))
    done, _ = await asyncio.wait({reply, watch}, return_when=asyncio.FIRST_COMPLETED)
    if reply in done:
        watch.cancel()
        return reply.result()
    reply.cancel()
    task_poll_kernel_alive.cancel()
    return watch.result()                   # raises CellTimeoutError


def install():
    """Give every NotebookClient of this process the watchdog."""
    NotebookClient._async_poll_for_reply = _poll_with_watchdog
    NotebookClient.process_message = _process
