"""The growing transformer: depth schedule, growth keeping the function, weight scaling, payload sizes."""

import numpy as np
import pytest
import torch

from fedspeech.coordinator.strategies.scheduling import depth_for_round
from fedspeech.models import build_model, depth_of
from fedspeech.models.growth import grow
from fedspeech.models.train import get_arrays, set_arrays
from fedspeech.models.transformer import ScaledLinear
from fedspeech.protocol import weights
from fedspeech.protocol.messages import ModelSpec


def spec(depth: int, name: str = "transformer") -> ModelSpec:
    return ModelSpec(name, 8000, 8000, 10, depth)


def test_linear_schedule_adds_one_block_per_equal_span() -> None:
    assert [depth_for_round(r, 8, 4, "linear", 4) for r in range(1, 9)] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [depth_for_round(r, 6, 4, "linear", 2) for r in range(1, 7)] == [2, 2, 2, 4, 4, 4]
    # 10 rounds in 4 stages: spans of 3, 2, 3, 2 rounds (floor of (round - 1) * 4 / 10)
    assert [depth_for_round(r, 10, 4, "linear", 4) for r in range(1, 11)] == [1, 1, 1, 2, 2, 3, 3, 3, 4, 4]


def test_constant_and_custom_schedules() -> None:
    assert [depth_for_round(r, 5, 4, "constant", 4) for r in range(1, 6)] == [4] * 5
    assert [depth_for_round(r, 6, 4, "1,3,4", 0) for r in range(1, 7)] == [1, 1, 3, 3, 4, 4]


@pytest.mark.parametrize(
    "schedule, stages",
    [("2,1", 0), ("1,5", 0), ("one,two", 0), ("linear", 5), ("linear", 0)],
)
def test_bad_schedules_are_refused(schedule: str, stages: int) -> None:
    with pytest.raises(ValueError):
        depth_for_round(1, 10, 4, schedule, stages)


def _trained(depth: int, name: str = "transformer") -> dict[str, np.ndarray]:
    """Arrays of a model whose every weight is non-zero, as a trained one's would be."""
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    arrays = get_arrays(build_model(spec(depth, name)))
    return {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32) for k, v in arrays.items()}


def _outputs(arrays: dict[str, np.ndarray], name: str = "transformer") -> np.ndarray:
    model = build_model(spec(depth_of(arrays), name)).eval()
    set_arrays(model, arrays)
    waveforms = torch.from_numpy(np.random.default_rng(2).normal(0, 0.1, (4, 8000)).astype(np.float32))
    with torch.no_grad():
        return model(waveforms).numpy()


def test_growth_keeps_the_trained_blocks_and_the_function() -> None:
    before = _trained(1)
    after = grow(before, spec(3), seed=7)
    assert depth_of(after) == 3
    assert all(np.array_equal(after[name], value) for name, value in before.items())
    for name in ("blocks.1.out.weight", "blocks.2.ff2.weight"):
        assert not after[name].any(), "new blocks start with zero output projections"
    assert after["blocks.1.qkv.weight"].std() > 0.5, "the rest of a new block is initialised as usual"
    assert np.abs(_outputs(after) - _outputs(before)).max() < 1e-5


def test_copied_growth_starts_new_blocks_from_the_deepest_trained_one() -> None:
    name = "transformer_unscaled"
    before = _trained(2, name)
    after = grow(before, spec(4, name), seed=7, new_blocks="copied")
    assert all(np.array_equal(after[key], value) for key, value in before.items())
    for new in (2, 3):
        for part in ("norm1.weight", "norm2.bias", "qkv.weight", "qkv.bias", "ff1.weight", "ff1.bias"):
            assert np.array_equal(after[f"blocks.{new}.{part}"], before[f"blocks.1.{part}"]), part
        for part in ("out.weight", "out.bias", "ff2.weight", "ff2.bias"):
            assert not after[f"blocks.{new}.{part}"].any(), "its output projections start at zero"
    assert np.abs(_outputs(after, name) - _outputs(before, name)).max() < 1e-5
    fresh = grow(before, spec(4, name), seed=7)
    assert not np.array_equal(fresh["blocks.2.qkv.weight"], before["blocks.1.qkv.weight"])
    with pytest.raises(ValueError, match="new blocks"):
        grow(before, spec(4, name), seed=7, new_blocks="cloned")


def test_post_layer_norm_growth_changes_the_function() -> None:
    # why the dynamic transformer needs Front-LN: a zero block under post-LN still adds a LayerNorm
    name = "transformer_post_ln"
    before = _trained(1, name)
    after = grow(before, spec(2, name), seed=7)
    assert np.abs(_outputs(after, name) - _outputs(before, name)).max() > 1e-3


def test_growth_refuses_arrays_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="no"):
        grow(_trained(3), spec(2), seed=0)  # shrinking
    wrong = dict(_trained(1), **{"head.weight": np.zeros((5, 64), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        grow(wrong, spec(2), seed=0)


@pytest.mark.parametrize("scaled", [True, False])
def test_weight_scaling_makes_adam_steps_equal_across_layers(scaled: bool) -> None:
    torch.manual_seed(0)
    narrow, wide = ScaledLinear(16, 8, scaled=scaled), ScaledLinear(1024, 8, scaled=scaled)
    used = {layer: (layer.weight * layer.gain).detach() for layer in (narrow, wide)}
    for layer, fan_in in ((narrow, 16), (wide, 1024)):  # the same function at init either way: He's
        assert used[layer].std().item() == pytest.approx(np.sqrt(2 / fan_in), rel=0.15)
    optimizer = torch.optim.Adam([*narrow.parameters(), *wide.parameters()], lr=1e-3)
    loss = narrow(torch.randn(32, 16)).square().sum() + wide(torch.randn(32, 1024)).square().sum()
    loss.backward()
    optimizer.step()
    # Adam's first step moves every stored weight by about lr; what matters is the step relative to the
    # scale of the weight actually used
    relative = [
        ((layer.weight * layer.gain).detach() - used[layer]).abs().mean().item() / used[layer].std().item()
        for layer in (narrow, wide)
    ]
    ratio = relative[1] / relative[0]
    if scaled:
        assert ratio == pytest.approx(1.0, rel=0.1)
    else:  # unscaled, the wide layer's weights move 8x faster relative to their size: sqrt(1024 / 16)
        assert ratio == pytest.approx(8.0, rel=0.1)


def test_payload_holds_exactly_the_active_blocks() -> None:
    sizes = []
    for depth in (1, 2, 4):
        arrays = get_arrays(build_model(spec(depth)))
        blocks = {name.split(".")[1] for name in arrays if name.startswith("blocks.")}
        assert blocks == {str(i) for i in range(depth)}
        assert weights.decode(weights.encode(arrays))[0].keys() == arrays.keys()
        sizes.append(len(weights.encode(arrays)))
    block = sizes[1] - sizes[0]
    assert sizes[2] - sizes[1] == pytest.approx(2 * block, rel=0.01), "bytes grow linearly with depth"
