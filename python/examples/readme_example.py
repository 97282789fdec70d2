# Round-trip a bfloat16 KV chunk through a framed fp8 pipeline bound to its key.
import torch, kvserde

kv = (torch.arange(2 * 4 * 16 * 64) % 64 / 32 + 1).to(torch.bfloat16).reshape(2, 4, 16, 64)
key = kvserde.ObjectKey(b"\x00\x01\x02\x03", "meta-llama/Llama-3-8B")
serde = kvserde.create_serde({"type": "pipeline", "stages": [{"type": "fp8"}, {"type": "crc32c"}]})
blob = serde.serialize(kv, key=key)     # a bytearray holding exactly the frame
back = torch.empty_like(kv)
serde.deserialize(blob, back, key=key)  # decoded into the tensor's own memory, no copy
print(f"{kv.numel() * 2} bytes -> {len(blob)} bytes, max error {(back - kv).abs().max():.4f}")
