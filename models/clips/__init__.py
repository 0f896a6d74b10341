"""The clips a model learns from, torch-free (numpy, soundfile, soxr): task files and their labels, the
bundled corpora and their speaker partitions, folders of one's own recordings, audio loading, augmentation.

Never torch (a contract of pyproject.toml): the coordinator, the device daemon and `fedspeech listen` read
clips with it.
"""
