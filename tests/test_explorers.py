"""gaugebook.explorers: the chapters' precomputed interactive figures cover their grids, every
frame differs, and the RoPE commutant has the dimensions the algebra predicts."""
import html
import re

import pytest
import torch

from gaugebook.explorers import (bias_attention_explorer, ecd_explorer, rope_commutant,
                                 rope_commutant_explorer)


@pytest.mark.parametrize("frequencies, dimension", [
    ([0.0, 0.0], 16),  # nothing turns: all of gl(4)
    ([0.0, 1.0], 6),   # gl(2) on the still plane, C on the turning one
    ([1.0, 1.0], 8),   # equal frequencies: gl(2, C)
    ([1.0, 0.5], 4),   # distinct frequencies: C + C
])
def test_rope_commutant_dimension(frequencies, dimension):
    C = rope_commutant(frequencies)
    assert C.dimension == dimension
    assert C.freedom.sum().item() == pytest.approx(dimension)  # the explorer's frames show it


def test_freedom_tells_a_free_block_from_a_rotation_plane():
    """Theta = (0, 1): the still plane (coordinates 0, 2) is a free 2 x 2 block (freedom 1),
    the turning plane (1, 3) is a I + b J (each entry tied to another: 1/2); no entry mixes
    the planes (0). Equal dimensions would look alike without it (16 and 8 are both full)."""
    freedom = rope_commutant([0.0, 1.0]).freedom
    still, turning = [0, 2], [1, 3]
    assert torch.allclose(freedom[still][:, still], torch.ones(2, 2, dtype=freedom.dtype))
    assert torch.allclose(freedom[turning][:, turning], torch.full((2, 2), 0.5,
                                                                   dtype=freedom.dtype))
    assert freedom[still][:, turning].abs().max() < 1e-12
    assert rope_commutant([1.0, 1.0]).freedom.max() == pytest.approx(0.5)  # gl(2, C)


@pytest.mark.parametrize("make, n_frames", [
    (rope_commutant_explorer, 9), (ecd_explorer, 12), (bias_attention_explorer, 24)])
def test_every_frame_is_a_distinct_image(make, n_frames):
    explorer = make()
    assert len(explorer.frames) == n_frames
    assert all(f.startswith('<img src="data:image/png;base64,') for f in explorer.frames.values())
    assert len(set(explorer.frames.values())) == n_frames


def alt_texts(explorer):
    """Frame key -> the alt text of its image."""
    return {key: html.unescape(re.search(r'alt="([^"]*)"', frame).group(1))
            for key, frame in explorer.frames.items()}


def test_frame_alt_texts_state_what_the_frame_shows():
    """Not only the sliders' settings: the bias explorer's frames name the key most queries
    attend to and its weight, the ECD explorer's the final F and the well the path ends in."""
    bias = alt_texts(bias_attention_explorer())
    # direction 225 degrees, length 5 (indices 5, 2): one key takes every query
    assert re.search(r"length 5: every query puts the most weight on key \d \(0\.\d\d on average\)",
                     bias[5, 2])
    assert re.search(r"length 0: \d+ of the 10 queries put", bias[0, 0])
    ecd = alt_texts(ecd_explorer())
    assert all(re.search(r"final F = -?\d\.\d\d, (in the well near \([+-]1, [+-]1\)|above the "
                         r"passes)", text) for text in ecd.values())
    assert "in the well near (-1, -1), the lowest of the four" in ecd[0, 0]  # eta 1, F0 -1
    assert "above the passes between the wells" in ecd[0, 1]  # eta 1, F0 -0.6: F = 2.25
