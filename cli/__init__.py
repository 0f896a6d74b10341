"""fedspeech: federated learning of speech models across fleets of small edge devices.

This package is the `fedspeech` command. It composes the coordinator and the device daemon, which never
import each other. The demo, the benchmarks and the emulated device fleet they train on are the
distribution fedspeech-bench (bench/), whose commands `fedspeech` adds when it is installed.
"""

__version__ = "0.1.0"
