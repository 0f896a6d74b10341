"""An embedded MQTT broker (amqtt) for one-machine runs, served from its own thread."""

import asyncio
import logging
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
        """Start listening; return once the broker accepts connections."""
        from amqtt.broker import Broker

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._thread.start()

        async def start() -> None:
            broker = Broker(config)
            await broker.start()
            self._broker = broker

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=15)
        log.info("embedded MQTT broker listening on %s", self.url)

    def stop(self) -> None:
        """Shut the broker down and end its thread."""
        if self._broker is not None:
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
