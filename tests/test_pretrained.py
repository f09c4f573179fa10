"""Chapter 12's pretrained-GPT-2 path without a network.

``GPT.from_huggingface("gpt2")`` is how the chapter loads GPT-2 small's weights online. The same
call with a directory written by ``save_pretrained`` goes through the same loader; here that
directory holds a small random GPT-2. Offline, a name that is in no cache must fail with a
message that says how to get the weights.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gaugebook.gpt import GPT

transformers = pytest.importorskip("transformers")

V, T = 97, 16


@pytest.fixture(scope="module")
def saved_gpt2(tmp_path_factory):
    """A random GPT-2 (2 layers, 4 heads, D = 32) and the directory it was saved to."""
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # LayerNorms away from their identity initialisation
        for name, p in hf.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("gpt2-random")
    hf.save_pretrained(path)
    return hf, path


def test_loads_a_saved_model_by_path_with_the_same_logits(saved_gpt2):
    hf, path = saved_gpt2
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))  # (B, T)
    with torch.no_grad():
        expected = hf(idx).logits  # (B, T, V)
        from_dir = GPT.from_huggingface(str(path)).eval()
        in_memory = GPT.from_huggingface(hf).eval()
        logits = from_dir(idx)[0]
        assert torch.equal(logits, in_memory(idx)[0])  # the saved weights, bit for bit
    assert (logits - expected).abs().max() < 1e-5
    assert expected.abs().max() > 0.1  # not a comparison of near-zero numbers
    assert GPT.from_huggingface(path).num_params() == from_dir.num_params()  # a Path works too


def test_missing_weights_offline_say_how_to_get_them(tmp_path):
    """A fresh process (the hub reads HF_HUB_OFFLINE when it is imported) with an empty cache."""
    script = textwrap.dedent("""
        from gaugebook.gpt import GPT
        try:
            GPT.from_huggingface("gpt2")
        except OSError as error:
            print(error)
        else:
            raise SystemExit("loaded GPT-2 weights with no network and an empty cache")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout
    assert "cannot load GPT-2 weights 'gpt2'" in message
    assert "hf download gpt2 --local-dir DIR" in message
    assert "GPT.from_huggingface(\"DIR\")" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_a_missing_directory_is_an_error_not_a_download(tmp_path):
    with pytest.raises(OSError, match="cannot load GPT-2 weights"):
        GPT.from_huggingface(str(tmp_path / "no-such-model"))
