#!/usr/bin/env python3
"""A GGUF model dequantized by transformers (with the ``gguf`` package) and saved as a plain bf16 Hugging Face folder
that sglang loads: ``convert_gguf.py DIR FILE.gguf OUT``. transformers will not save a model it loaded from GGUF
(it counts as quantized), so the weights go out through safetensors and the config without its quantization."""
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

src, name, dst = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.time()
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
os.makedirs(dst, exist_ok=True)
sd = {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    sd.pop("lm_head.weight", None)
save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
cfg = model.config.to_dict()
cfg.pop("quantization_config", None)
cfg.pop("dtype", None)
cfg["torch_dtype"] = "bfloat16"
cfg["architectures"] = [type(model).__name__]
rope = cfg.get("rope_parameters") or {}
if "rope_theta" in rope and "rope_theta" not in cfg:
    cfg["rope_theta"] = rope["rope_theta"]  # for readers of the older key
with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
tok.save_pretrained(dst)
print(f"converted in {time.time() - t:.1f} s: {cfg['architectures']}, {cfg['num_hidden_layers']} layers, hidden "
      f"{cfg['hidden_size']}, vocab {cfg['vocab_size']}, rope_theta {cfg.get('rope_theta')}")
ids = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                              add_generation_prompt=True, return_tensors="pt")
ids = ids if torch.is_tensor(ids) else ids["input_ids"]
out = model.generate(ids, max_new_tokens=24, do_sample=False)
print("greedy answer:", repr(tok.decode(out[0][ids.shape[1]:])))
