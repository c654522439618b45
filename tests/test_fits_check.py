"""`lfk fits ... --check` (issue 46 item 4) proves the prediction on the user's own architecture: for a Llama-3-8B
config.json it builds a reduced copy of the same classes (2 layers, width 64, vocabulary 128), runs its training step
on real gloo CPU ranks at the job's world, and prints predicted vs measured with the verdict, within 90 s of the check
on 2 cores. Reference: the CPU allocator's running total on each real rank (`lora_fsdp_kit.steppeak`)."""
import json, re

from lora_fsdp_kit.__main__ import main

LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="bfloat16")

def test_check_proves_the_prediction_on_a_reduced_copy(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    rc = main(["fits", "--config", str(path), "--world", "2", "--device-memory", "80GiB", "--flavour", "fsdp2",
               "--activation-checkpointing", "off", "--check"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    head, check = out.split("\ncheck: a reduced copy", 1)
    assert "LlamaForCausalLM reduced copy" in check and "2 real gloo ranks" in check, check
    assert len(re.findall(r"rank \d: predicted [\d,]+ B \(worst [\d,]+\), measured [\d,]+ B", check)) == 2, check
    assert "prediction verified on a reduced copy" in check, check
    seconds = int(re.search(r"\((\d+) s\):", check).group(1))
    assert seconds <= 90, f"the check took {seconds} s (goal: 90 s on 2 cores)"
