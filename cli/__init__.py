"""fedspeech: federated learning of speech models across fleets of small edge devices.

This package is the `fedspeech` command and the one-machine tools it runs: the demo, the strategy
benchmark and the emulated device fleet they train on. It composes the coordinator and the device
daemon, which never import each other.
"""

__version__ = "0.1.0"
