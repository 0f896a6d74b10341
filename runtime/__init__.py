"""Running a fedspeech model without torch: the ONNX model session, the streaming detector and its speech
gate, audio from a file or the microphone, the follower of announced models, the listening loop, the rule
of which announcement is newest, and bounded HTTP requests to the coordinator.

numpy and onnxruntime only, never torch, training code or the device daemon (contracts of pyproject.toml):
what `fedspeech listen` runs on, and what a device's model keeper shares with it.
"""
