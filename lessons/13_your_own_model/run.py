"""Lesson 13: your own model: a plain training loop with torch's checkpoint, recorded by one `with` line; a Hugging
Face model through ckpt_viz.hf.enable."""
from ckpt_viz import lessons
from ckpt_viz.analysis.handles import handle_labels, observed_mode
from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time


def record_my_loop(seq=64, steps=2):
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    import ckpt_viz

    class Net(nn.Module):
        def __init__(self, width=32, depth=3):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    width, 4, 4 * width, dropout=0.0, batch_first=True)
                for _ in range(depth))
            self.head = nn.Linear(width, 1)

        def forward(self, x):
            for layer in self.layers:  # your model checkpoints its layers with torch
                x = checkpoint(layer, x, use_reentrant=False)
            return self.head(x).pow(2).mean()

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(8, seq, 32)
        with ckpt_viz.record(memory=True, model=model) as rec:  # the one added line
            loss = model(x)
            rec.mark("loss")
            loss.backward()
            rec.mark("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return rec.trace  # the last step's


def record_hf(seq=32, layers=4):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import ckpt_viz

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).train()  # random weights: nothing is downloaded
    # ckpt_viz's checkpoint in HF's layers, through HF's own call
    ckpt_viz.hf.enable(model, use_reentrant=True)
    ids = torch.randint(0, config.vocab_size, (2, seq))
    with ckpt_viz.record(memory=True, model=model) as rec:
        loss = model(input_ids=ids, labels=ids).loss
        rec.mark("loss")
        loss.backward()
        rec.mark("end")
    return rec.trace


def check_my_loop(trace, runs):
    life = lifecycle(trace)
    labels = handle_labels(trace)
    assert life.replay_count() == len(life.handle_ids) > 0
    assert all(labels[h].startswith("layers.") for h in life.handle_ids), labels
    at_end = trace.memory[-1].bytes_by_category
    assert at_end["gradients"] == at_end["parameters"] > 0, at_end
    return {"handles": len(life.handle_ids), "names": ", ".join(labels[h] for h in life.handle_ids),
            "mode": observed_mode(trace), "peak": lessons.kib(lessons.peak(trace)),
            "grads": lessons.kib(at_end["gradients"]), "replays": life.replay_count()}


def check_hf(trace, runs, knobs):
    life = lifecycle(trace)
    labels = handle_labels(trace)
    names = [labels[h] for h in life.handle_ids]
    assert names == [f"model.layers.{i}" for i in range(knobs["layers"])], names
    assert life.replay_count() == len(names)
    return {"handles": len(names), "first": names[0], "last": names[-1], "mode": observed_mode(trace),
            "peak": lessons.kib(lessons.peak(trace))}


def check_sequence(trace, runs):
    spent = recompute_time(trace)
    at_peak = lessons.peak_by_category(trace)
    assert spent.replays == len(lifecycle(trace).handle_ids) > 0
    top = max(at_peak, key=at_peak.get)
    return {"peak": lessons.kib(lessons.peak(trace)), "top": top.replace("_", " "),
            "top_bytes": lessons.kib(at_peak[top]), "replays": spent.replays,
            "time": lessons.ms(spent.replay_ns)}
