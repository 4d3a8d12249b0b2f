"""Real PyTorch workloads for recording allocator traces and for measuring
allocators side by side.

Every model is built from a config (no weights are downloaded) and fed random
tokens or images from a fixed seed, so the same workload makes the same
requests in every process. `run(name, scale)` returns a checksum of the final
losses or outputs, so runs under different allocators can be compared.

Scales: "fixture" is a few steps (small snapshots for the test suite);
"full" is long enough for the allocator's steady state to show.
"""

import time

import torch

WORKLOADS = {}


def workload(fn):
    WORKLOADS[fn.__name__] = fn
    return fn


def _steps(scale, fixture, full):
    return fixture if scale == "fixture" else full


def _lengths(gen, n, low, high):
    return [int(x) for x in torch.randint(low, high + 1, (n,), generator=gen)]


def _adamw(model_class, config, seed):
    """`model_class(config)` on the GPU, its weights drawn from `seed`, and its
    AdamW optimizer."""
    torch.manual_seed(seed)
    model = model_class(config).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _train_step(opt, loss, on_step):
    """One optimizer step on `loss`; returns what `on_step` makes of the loss."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return on_step(loss)


@workload
def resnet50_train(scale, on_step):
    """torchvision ResNet-50: SGD training at batch 32, then inference at
    varying batch sizes."""
    import torchvision

    gen = torch.Generator().manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    checksum = 0.0
    for _ in range(_steps(scale, 2, 8)):
        x = torch.randn(32, 3, 224, 224, generator=gen).cuda()
        y = torch.randint(0, 1000, (32,), generator=gen).cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        checksum += _train_step(opt, loss, on_step)
    model.eval()
    with torch.no_grad():
        for batch in _steps(scale, [3, 17], [1, 8, 17, 64, 100, 33, 5]):
            out = model(torch.randn(batch, 3, 224, 224, generator=gen).cuda())
            checksum += on_step(out.float().sum())
    return checksum


@workload
def llama_finetune(scale, on_step):
    """A Llama-style decoder (transformers, bf16 autocast) fine-tuned with
    AdamW on random token sequences of varying length."""
    from transformers import LlamaConfig, LlamaForCausalLM

    gen = torch.Generator().manual_seed(1)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    model, opt = _adamw(LlamaForCausalLM, config, seed=1)
    checksum = 0.0
    n = _steps(scale, 3, 12)
    for length in _lengths(gen, n, 64, 1024):
        ids = torch.randint(0, config.vocab_size, (4, length), generator=gen).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        checksum += _train_step(opt, loss, on_step)
    return checksum


@workload
def mixtral_moe_infer(scale, on_step):
    """A Mixtral-style mixture of experts (8 experts, top 2, bf16): greedy
    generation from prompts of varying length and batch."""
    from transformers import MixtralConfig, MixtralForCausalLM

    gen = torch.Generator().manual_seed(2)
    config = MixtralConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(2)
    model = MixtralForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    checksum = 0.0
    n = _steps(scale, 2, 8)
    lengths = _lengths(gen, n, 16, 512)
    batches = _lengths(gen, n, 1, 4)
    with torch.no_grad():
        for length, batch in zip(lengths, batches):
            ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen).cuda()
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=_steps(scale, 8, 32),
                do_sample=False,
                pad_token_id=0,
            )
            checksum += on_step(out.sum())
    return checksum


@workload
def vit_infer(scale, on_step):
    """torchvision ViT-B/16 inference in fp16 at varying batch sizes."""
    import torchvision

    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    model = torchvision.models.vit_b_16()
    # torchvision zero-initialises the head, which would make every output (and
    # the checksum) zero; a random head on the CPU allocates nothing on the GPU.
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    model = model.to(device="cuda", dtype=torch.float16).eval()
    checksum = 0.0
    with torch.no_grad():
        for batch in _steps(scale, [2, 9], [1, 3, 8, 16, 33, 64, 128, 7, 50]):
            x = torch.randn(batch, 3, 224, 224, generator=gen).to("cuda", torch.float16)
            checksum += on_step(model(x).float().sum())
    return checksum


@workload
def gpt2_train(scale, on_step):
    """A GPT-2 (transformers, fp32) trained with AdamW on sequences of varying
    length and batch."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gen = torch.Generator().manual_seed(4)
    config = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)
    model, opt = _adamw(GPT2LMHeadModel, config, seed=4)
    checksum = 0.0
    n = _steps(scale, 3, 12)
    for length, batch in zip(_lengths(gen, n, 32, 1024), _lengths(gen, n, 2, 8)):
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        checksum += _train_step(opt, loss, on_step)
    return checksum


@workload
def bert_train(scale, on_step):
    """BERT sequence classification (transformers, fp32) trained with AdamW
    on sequences of varying length and batch."""
    from transformers import BertConfig, BertForSequenceClassification

    gen = torch.Generator().manual_seed(5)
    config = BertConfig(num_hidden_layers=6, num_labels=4)
    model, opt = _adamw(BertForSequenceClassification, config, seed=5)
    checksum = 0.0
    n = _steps(scale, 3, 12)
    for length, batch in zip(_lengths(gen, n, 16, 512), _lengths(gen, n, 4, 32)):
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen).cuda()
        labels = torch.randint(0, 4, (batch,), generator=gen).cuda()
        loss = model(input_ids=ids, labels=labels).loss
        checksum += _train_step(opt, loss, on_step)
    return checksum


@workload
def t5_seq2seq_train(scale, on_step):
    """A T5-style encoder-decoder (transformers, bf16 autocast) trained with AdamW on
    random source and target sequences whose lengths change every step: the
    variable-length sequence-to-sequence case."""
    from transformers import T5Config, T5ForConditionalGeneration

    gen = torch.Generator().manual_seed(6)
    config = T5Config(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_decoder_layers=6,
        num_heads=8,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model, opt = _adamw(T5ForConditionalGeneration, config, seed=6)
    checksum = 0.0
    n = _steps(scale, 3, 16)
    sources = _lengths(gen, n, 32, 512)
    targets = _lengths(gen, n, 8, 256)
    batches = _lengths(gen, n, 4, 16)
    for source, target, batch in zip(sources, targets, batches):
        ids = torch.randint(1, config.vocab_size, (batch, source), generator=gen).cuda()
        labels = torch.randint(1, config.vocab_size, (batch, target), generator=gen).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        checksum += _train_step(opt, loss, on_step)
    return checksum


def run(name, scale="full", times=None):
    """Run one workload; returns (checksum, seconds per step, steps). The median
    leaves out the first step, which builds the model; `times`, a list, gets every
    step's seconds appended."""
    torch.manual_seed(0)
    seconds = []
    last = [time.perf_counter()]

    def on_step(value):
        v = float(value.detach().float().item())  # synchronizes
        now = time.perf_counter()
        seconds.append(now - last[0])
        last[0] = now
        return v

    checksum = WORKLOADS[name](scale, on_step)
    if times is not None:
        times.extend(seconds)
    steady = sorted(seconds[1:] or seconds)
    median = steady[len(steady) // 2] if steady else 0.0
    return checksum, median, len(seconds)
