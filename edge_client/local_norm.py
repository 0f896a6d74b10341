"""The normalisation arrays a device keeps for itself under FedBN or SiloBN, in its state folder.

Under FedBN (Li et al. 2021) the batch-normalisation tensors never leave the device: it trains with its
own, laid over each task's weights, and keeps them across rounds and restarts. Under SiloBN (Andreux et
al. 2020) it keeps only the running statistics of its own clips. Torch-free, so that the model keeper
can lay them over the global ONNX model too.
"""

import logging
from pathlib import Path

from fedspeech.protocol import weights
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

NORM_FILE = "local_norm.safetensors"


class LocalNorm:
    """The device's own normalisation arrays (get_arrays names), kept as safetensors in its state folder."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / NORM_FILE

    def load(self) -> Arrays | None:
        """The kept arrays, or None if there are none or the file cannot be read (with a warning)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the kept normalisation layers %s: %s", self.path, exc)
            return None
        try:
            arrays, _ = weights.decode(data)
        except weights.WeightsError as exc:
            log.warning("ignoring the kept normalisation layers %s: %s", self.path, exc)
            return None
        return arrays

    def save(self, arrays: Arrays) -> None:
        """Keep arrays in place of any kept before, atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, weights.encode(arrays))

    def forget(self) -> None:
        """Drop the kept arrays, if any."""
        if self.path.exists():
            log.info("no longer keeping local normalisation layers: removing %s", self.path)
            self.path.unlink(missing_ok=True)


def lay_over(arrays: Arrays, kept: Arrays | None, names: set[str]) -> Arrays:
    """arrays with the kept ones in place of those named, if they fit; else arrays as they are.

    The kept arrays fit when they are exactly the named ones, with the shapes and dtypes of arrays'; kept
    arrays that do not (another model's) are ignored with a warning.
    """
    if not kept:
        return arrays
    reference = {name: arrays[name] for name in names if name in arrays}
    try:
        if reference.keys() != names:
            raise weights.WeightsError(f"the model lacks arrays {sorted(names - reference.keys())}")
        weights.check_like(kept, reference)
    except weights.WeightsError as exc:
        log.warning("the kept normalisation layers do not fit this model (%s): starting from the task's", exc)
        return arrays
    return {**arrays, **kept}
