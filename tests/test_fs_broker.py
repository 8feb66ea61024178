"""The embedded broker's transport writes each message whole before a consumer can see it (workers.fs_broker).

kombu's file-system transport creates the message file and then writes into it; a consumer polling in between read
an empty file and its worker died of the JSON error (seen in CI under load). The test consumes at the moment the
payload is being written: kombu's transport hands the consumer an empty file there, ours shows it nothing yet."""

from __future__ import annotations

import json
from queue import Empty

import pytest
from kombu import Connection
from kombu.transport import TRANSPORT_ALIASES, filesystem

from workers import fs_broker


def _channel(scheme: str, folder) -> tuple[Connection, filesystem.Channel]:
    TRANSPORT_ALIASES.setdefault(fs_broker.SCHEME, "workers.fs_broker:Transport")
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
    conn = Connection(f"{scheme}://localhost//", transport_options=opts)
    return conn, conn.default_channel


@pytest.mark.parametrize("scheme", [fs_broker.SCHEME, "filesystem"])
def test_a_consumer_never_sees_a_message_before_it_is_whole(scheme, tmp_path, monkeypatch):
    conn, channel = _channel(scheme, tmp_path)
    seen = []
    module = fs_broker if scheme == fs_broker.SCHEME else filesystem
    encode = module.str_to_bytes

    def encode_while_a_consumer_polls(text):
        try:
            seen.append(("message", channel._get("q")))
        except Empty:
            seen.append(("nothing", None))
        except json.JSONDecodeError:
            seen.append(("torn", None))
        return encode(text)

    monkeypatch.setattr(module, "str_to_bytes", encode_while_a_consumer_polls)
    try:
        channel._put("q", {"body": "x"})
        monkeypatch.undo()
        if scheme == fs_broker.SCHEME:
            assert seen == [("nothing", None)]
            assert channel._get("q") == {"body": "x"}  # and afterwards the whole message
        else:  # kombu's own: the file exists, empty, while the payload is encoded
            assert seen == [("torn", None)]
    finally:
        conn.release()


def test_only_whole_messages_are_left_in_the_queue_folder(tmp_path):
    conn, channel = _channel(fs_broker.SCHEME, tmp_path)
    try:
        for i in range(5):
            channel._put("q", {"i": i})
        names = sorted(p.name for p in tmp_path.iterdir())
        assert len(names) == 5 and all(n.endswith(".q.msg") and not n.startswith(".") for n in names)
        assert sorted(channel._get("q")["i"] for _ in range(5)) == list(range(5))  # same-ms order: by uuid
    finally:
        conn.release()
