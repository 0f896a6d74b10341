"""fedspeech: federated learning of speech models across fleets of small edge devices."""

__version__ = "0.1.0"
