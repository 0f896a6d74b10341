"""fedspeech-bench: fedspeech's benchmarks, the demo, and the emulated device fleet they train on.

`fedspeech bench ...` and `fedspeech demo` (commands) find this package by its entry points; the
`fedspeech` wheel devices install carries none of it.
"""
