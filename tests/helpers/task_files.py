"""A task file as a user writes it."""

GOOD = 'name = "commands"\nlabels = ["yes", "no", "up"]\nsample_rate = 16000\nclip_seconds = 1.5\n'
