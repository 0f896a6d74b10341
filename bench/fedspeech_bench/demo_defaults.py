"""What `fedspeech demo` runs by default and where it writes: its fleet, rounds and epochs, and the model
that the benchmarks listen with unless given another.
"""

from pathlib import Path

DEMO_OUT = Path("fedspeech-demo")
DEMO_MODEL = DEMO_OUT / "model.onnx"  # what `fedspeech demo` exports, the model the benchmarks listen with
# Pi 5 and Pi 4 class devices: pi-mix's Pi 3s would set the pace of every round (`--fleet pi-mix`)
DEMO_FLEET = "pi5-pi4"
# On a machine whose cores are free, a Pi 5's three epochs take about as long as a Pi 4's one
# (epochs_only gives the Pi 4s one), so the third costs the round little. In-process runs of the demo's
# rounds (Pi 5s 3 epochs, Pi 4s 1) ended at 0.987 of the held-out clips after 20 rounds and 0.993 after
# 22; with 2 epochs, 20 rounds ended at 0.953. The emulated fleet itself then ended 22 rounds at 0.9933
# on one machine and 0.9833 on another; 25 rounds reached 0.99 at rounds 23, 24 and 25.
DEMO_EPOCHS = 3
DEMO_ROUNDS = 25
