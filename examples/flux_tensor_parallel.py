"""FLUX text-to-image with tensor parallelism on `neuron`, one process per NeuronCore.

    torchrun --nproc-per-node 2 examples/flux_tensor_parallel.py
    torchrun --nproc-per-node 2 examples/flux_tensor_parallel.py --steps 8 --size 384 --out flux.png

Each rank builds the same small FLUX pipeline (FluxTransformer2DModel, AutoencoderKL, CLIP and T5
text encoders) from configs with seeded random weights, so nothing is downloaded; with a real
checkpoint you would call `FluxPipeline.from_pretrained(...)` and, for the transformer,
`FluxTransformer2DModel.from_pretrained(..., parallel_config=TensorParallelConfig(tp_degree=2))`.
The transformer is sharded with Diffusers' own tensor parallelism,
`transformer.enable_parallelism(config=TensorParallelConfig(tp_degree=N))`: the Linears of the
model's `_tp_plan` are split column- and row-wise across the ranks (each rank holds 1/N of them on
its own `neuron` device) and the `neuron` c10d backend all-reduces the partial results. Text encoders
and VAE are replicated. Rank 0 writes the image (random weights: it looks like coloured noise).

The script also runs the same pipeline unsharded on each rank's device and checks that the
tensor-parallel image equals it (exit status 1 if not), and prints how long each took.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # importing torch registers the `neuron` device (torch-neuronx autoload)
import torch.distributed as dist


def build_pipeline(size: int):
    """A small FLUX pipeline with seeded random weights (identical on every rank)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from torch_neuronx.testing.diffusers_pipelines import byte_tokenizer  # a tokenizer made in code, no download

    torch.manual_seed(0)
    vocab = 259  # the byte tokenizer's 256 bytes + <pad>, <s>, </s>
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=4, num_single_layers=8, attention_head_dim=64,
        num_attention_heads=8, joint_attention_dim=256, pooled_projection_dim=128, axes_dims_rope=[8, 28, 28],
        guidance_embeds=True)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=[32, 64, 64, 64],
                        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                        layers_per_block=1, norm_num_groups=16, sample_size=size, use_quant_conv=False,
                        use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=77, pad_token_id=256,
                                        bos_token_id=257, eos_token_id=258))
    t5 = T5EncoderModel(T5Config(vocab_size=vocab, d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8,
                                 pad_token_id=256, eos_token_id=258))
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                        text_encoder=clip, tokenizer=byte_tokenizer(77, bos_eos=True), text_encoder_2=t5,
                        tokenizer_2=byte_tokenizer(128), transformer=transformer)
    for module in (transformer, vae, clip, t5):
        module.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, args):
    with torch.no_grad():
        return pipe(prompt=args.prompt, height=args.size, width=args.size, num_inference_steps=args.steps,
                    guidance_scale=3.5, max_sequence_length=128, output_type="pt",
                    generator=torch.Generator("cpu").manual_seed(args.seed)).images


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", default="a lighthouse on a cliff above a stormy sea, oil painting")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image height and width (a multiple of 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="flux_tensor_parallel.png")
    p.add_argument("--no-check", action="store_true", help="skip the unsharded reference run")
    args = p.parse_args()

    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ.get("LOCAL_RANK", rank)) % torch.neuron.device_count())
    torch.neuron.set_device(device)

    from diffusers import TensorParallelConfig
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    pipe = build_pipeline(args.size)
    full = sum(p.numel() for p in pipe.transformer.parameters())

    reference = None
    if not args.no_check:  # the same pipeline, unsharded, on this rank's device
        import copy

        single = copy.deepcopy(pipe).to(device)
        generate(single, args)  # warm-up
        t0 = time.perf_counter()
        reference = generate(single, args)
        t_single = time.perf_counter() - t0
        del single

    # Shard the transformer across all ranks (weights must still be on CPU), then place the rest.
    pipe.transformer.enable_parallelism(config=TensorParallelConfig(tp_degree=world))
    pipe.to(device)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in pipe.transformer.parameters())

    generate(pipe, args)  # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    images = generate(pipe, args)
    dist.barrier()
    t_tp = time.perf_counter() - t0

    ok = True
    if reference is not None:
        err = (images - reference).abs().max().item()
        ok = err < 1e-3
        errs = [None] * world
        dist.all_gather_object(errs, err)
    if rank == 0:
        print(f"FLUX transformer: {full / 1e6:.1f} M parameters, {local / 1e6:.1f} M on each of {world} ranks")
        print(f"{args.steps} steps at {args.size}x{args.size}: tensor parallel on {world} ranks {t_tp:.1f} s"
              + (f", one device {t_single:.1f} s" if reference is not None else ""))
        if reference is not None:
            print(f"largest difference from the one-device image, per rank: {', '.join(f'{e:.2g}' for e in errs)}"
                  f" -> {'equal within 1e-3' if all(e < 1e-3 for e in errs) else 'MISMATCH'}")
        from diffusers.image_processor import VaeImageProcessor

        VaeImageProcessor.numpy_to_pil(VaeImageProcessor.pt_to_numpy(images.cpu()))[0].save(args.out)
        print(f"wrote {args.out}")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
