"""The embedded broker's transport: kombu's file-system transport, except that a message file appears in the queue
folder only once it is whole.

kombu's own `_put` creates `<time>_<uuid>.<queue>.msg` and then writes into it, while a consumer's `_get` lists the
folder, moves the first matching file away and parses it without waiting for the writer: a consumer that comes
between the two reads an empty file, and the JSON error stops its worker. Under load (the test suite on 2 cores)
that happened: the dashboard's measurement worker died before the job's first batch. Here the message is written
under a name no consumer matches and renamed into place, which is atomic within one folder.

And a worker's wait for messages ends at its next poll once the worker stops (WAKE), not after the 2 s Celery's
consumer loop waits, so Ctrl-C is seen at once.
"""

from __future__ import annotations

import os
import threading
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SCHEME = "tilefarm-fs"  # the broker URL scheme make_celery registers for this transport
WAKE = threading.Event()  # set when this process's worker stops (workers.worker): a wait for messages ends


class Channel(filesystem.Channel):
    # kombu.transport.filesystem.Channel._put already differs from its base (payload vs message): follow the parent
    def _put(self, queue, payload, **kwargs):  # type: ignore[override]
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")  # `_get` matches only "*.<queue>.msg"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

    # kombu's virtual Transport.drain_events (its signature, not its base's), except that the sleep between polls
    # ends when WAKE is set
    def drain_events(self, connection, timeout=None):  # type: ignore[override]
        assert self.cycle is not None  # made when the transport is
        start = monotonic()
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if WAKE.is_set() or (timeout is not None and monotonic() - start >= timeout):
                    raise TimeoutError from None  # socket.timeout, which Celery's loop expects
                WAKE.wait(self.polling_interval or 0)
