"""An embedded MQTT broker (amqtt) for one-machine runs, served from its own thread."""

import asyncio
import logging
import os
import threading

log = logging.getLogger(__name__)


class EmbeddedBroker:
    """amqtt broker on host:port, running an asyncio loop in a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 1883) -> None:
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mqtt-broker", daemon=True)
        self._broker = None
        for chatty in ("amqtt", "transitions"):
            logging.getLogger(chatty).setLevel(logging.WARNING)

    @property
    def url(self) -> str:
        """mqtt:// URL clients connect to."""
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> None:
        """Start listening; return once the broker accepts connections. OSError if it cannot listen there."""
        from amqtt.broker import Broker
        from amqtt.errors import BrokerError

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._thread.start()

        async def start() -> None:
            broker = Broker(config)
            await broker.start()
            self._broker = broker

        # amqtt logs a failed start with a traceback; the OSError below says it in one line instead
        amqtt_log = logging.getLogger("amqtt.broker")
        level = amqtt_log.level
        amqtt_log.setLevel(logging.CRITICAL)
        try:
            asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=15)
        except BrokerError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno is not None:  # the port taken, the host not ours
                raise OSError(cause.errno, os.strerror(cause.errno)) from None
            raise OSError(str(cause or exc)) from None
        finally:
            amqtt_log.setLevel(level)
        log.info("embedded MQTT broker listening on %s", self.url)

    def stop(self) -> None:
        """Shut the broker down and end its thread."""
        if self._broker is not None:
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
