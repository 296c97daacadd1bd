# SPDX-License-Identifier: MIT
"""Tensor names of a diffusers UNet2DConditionModel in the original
(CompVis LDM / "single file") layout that from_single_file converts back,
for the SD-shaped UNets of the tests and of scripts/bench-loader.

Written from the layout itself: the LDM UNet numbers its blocks
`input_blocks.N` (conv_in, then per down block its resnet/attention pairs
and a downsampler), `middle_block.{0,1,2}` and `output_blocks.N` (per up
block its resnet/attention pairs, the upsampler riding on the last one).
"""
import re

LDM_PREFIX = "model.diffusion_model."

# Inside a resnet: diffusers name -> LDM name.
_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2",
           "norm2": "out_layers.0", "conv2": "out_layers.3",
           "time_emb_proj": "emb_layers.1",
           "conv_shortcut": "skip_connection"}

_TOP = {"time_embedding.linear_1": "time_embed.0",
        "time_embedding.linear_2": "time_embed.2",
        "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0",
        "conv_out": "out.2"}


def _resnet(rest):
    part, _, tail = rest.partition(".")
    return _RESNET.get(part, part) + "." + tail


def ldm_key(name, layers_per_block, up_attn):
    """The LDM name of diffusers tensor @name. @up_attn[i] says whether
    up block i has attentions (its upsampler then sits at index 2)."""
    per = layers_per_block + 1
    for k, v in _TOP.items():
        if name.startswith(k + "."):
            return LDM_PREFIX + v + name[len(k):]
    m = re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)",
                 name)
    if m:
        i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        slot, rest = (0, _resnet(rest)) if kind == "resnets" else (1, rest)
        return "%sinput_blocks.%d.%d.%s" % (LDM_PREFIX, 1 + i * per + j,
                                            slot, rest)
    m = re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", name)
    if m:
        return "%sinput_blocks.%d.0.op.%s" % (LDM_PREFIX,
                                              (int(m[1]) + 1) * per, m[2])
    m = re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", name)
    if m:
        if m[1] == "resnets":
            return "%smiddle_block.%d.%s" % (LDM_PREFIX, 2 * int(m[2]),
                                             _resnet(m[3]))
        return "%smiddle_block.1.%s" % (LDM_PREFIX, m[3])
    m = re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)",
                 name)
    if m:
        i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        slot, rest = (0, _resnet(rest)) if kind == "resnets" else (1, rest)
        return "%soutput_blocks.%d.%d.%s" % (LDM_PREFIX, i * per + j, slot,
                                             rest)
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", name)
    if m:
        i = int(m[1])
        return "%soutput_blocks.%d.%d.%s" % (
            LDM_PREFIX, i * per + layers_per_block, 2 if up_attn[i] else 1,
            m[2])
    raise KeyError("no LDM name for " + name)


def ldm_names(config, names):
    """{diffusers name: LDM name} for a UNet2DConditionModel config."""
    up_attn = ["Attn" in t for t in config["up_block_types"]]
    lpb = config["layers_per_block"]
    out = {n: ldm_key(n, lpb, up_attn) for n in names}
    assert len(set(out.values())) == len(out), "LDM names collide"
    return out


# The SD 1.5 UNet (~860M parameters) and a tiny UNet of the same shape.
SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4,
                 layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280),
                 down_block_types=("CrossAttnDownBlock2D",) * 3 +
                 ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                 cross_attention_dim=768, attention_head_dim=8)
TINY_SD_UNET = dict(SD15_UNET, sample_size=16, block_out_channels=(32, 32, 64,
                                                                    64),
                    cross_attention_dim=64, norm_num_groups=32)
