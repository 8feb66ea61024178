"""The farm's Redis transport: kombu's, except that a channel whose connection is gone says so with a connection
error instead of an AttributeError.

When Redis goes away under a worker that holds unacknowledged messages (every running task: acks_late), Celery's
consumer collects the broken connection (which drops the transport's client, and then the channel's transport) and
reconnects on a new one. Two calls still reach the old channel: closing it gives the unacknowledged messages back,
and a task that was running all along acknowledges its message on it when it ends. Both need a new Redis client,
whose parameters kombu builds from the client or transport that is gone: AttributeError("'NoneType' object has no
attribute 'hostname'" or "'client'"), which Celery does not ignore, and the worker ended ("Unrecoverable error").
A connection error is what Celery expects there: the close ignores it, the acknowledgement is logged as not done
("Couldn't ack"), and the message comes back after the visibility timeout, where a duplicate finds its work done
(or it was lost with a Redis that keeps nothing: workers.farm sends such a batch again)."""

from __future__ import annotations

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

TRANSPORT = "workers.redis_broker:Transport"  # the broker_transport make_celery names for redis:// URLs


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous=False):
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
