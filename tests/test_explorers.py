"""gaugebook.explorers: the chapters' precomputed interactive figures cover their grids, every
frame differs, and the RoPE commutant has the dimensions the algebra predicts."""
import pytest

from gaugebook.explorers import (bias_attention_explorer, ecd_explorer, rope_commutant,
                                 rope_commutant_explorer)


@pytest.mark.parametrize("frequencies, dimension", [
    ([0.0, 0.0], 16),  # nothing turns: all of gl(4)
    ([0.0, 1.0], 6),   # gl(2) on the still plane, C on the turning one
    ([1.0, 1.0], 8),   # equal frequencies: gl(2, C)
    ([1.0, 0.5], 4),   # distinct frequencies: C + C
])
def test_rope_commutant_dimension(frequencies, dimension):
    assert rope_commutant(frequencies).dimension == dimension


@pytest.mark.parametrize("make, n_frames", [
    (rope_commutant_explorer, 9), (ecd_explorer, 12), (bias_attention_explorer, 24)])
def test_every_frame_is_a_distinct_image(make, n_frames):
    explorer = make()
    assert len(explorer.frames) == n_frames
    assert all(f.startswith('<img src="data:image/png;base64,') for f in explorer.frames.values())
    assert len(set(explorer.frames.values())) == n_frames
