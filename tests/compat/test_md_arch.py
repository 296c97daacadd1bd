# SPDX-License-Identifier: MIT
"""Quantising views of model folders castfs has not checked are refused
(stop 41, found by a bug hunt).

castfs sees tensor names, not module classes. A bug hunt over 30
architectures found 2-D weights of modules that are no nn.Linear, which
castfs quantised and the loader then built as Linear layers around the
codes: LayoutLM's x/y/h/w_position_embeddings (int8 loaded silently with
34 % wrong logits), BERT's tied MLM decoder (fp8_dynamic loaded with logits
near 1e38), FalconLinear, MultiheadAttention's out_proj. The quantising
views (bitsandbytes, compressed-tensors) of a transformers folder are now
offered only for the architectures checked against the loader's own
quantisation (docs/MODELDIR.md); the others keep their cast views and
/.castfs/refused says why.
"""
import json
import os
import unittest

import torch
import transformers as T

import castfs_testlib as tl

QUANTISING = ("nf4", "fp4", "int8")
CASTS = ("bf16", "fp8")


def models():
    torch.manual_seed(7)
    layout = T.LayoutLMForSequenceClassification(T.LayoutLMConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=128, vocab_size=100, max_position_embeddings=32,
        max_2d_position_embeddings=64))
    mlm = T.BertForMaskedLM(T.BertConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=128, vocab_size=100, max_position_embeddings=32))
    llama = T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=100))
    return {"layout": layout, "mlm": mlm, "llama": llama}


class Architectures(unittest.TestCase):
    def test_unchecked_architectures_get_casts_only(self):
        with tl.tempdir() as src:
            for name, m in models().items():
                m.save_pretrained(os.path.join(src, name))
            # "architectures" missing: nothing says what the model is.
            with open(os.path.join(src, "llama", "config.json")) as f:
                cfg = json.load(f)
            del cfg["architectures"]
            os.makedirs(os.path.join(src, "anon"))
            with open(os.path.join(src, "anon", "config.json"), "w") as f:
                json.dump(cfg, f)
            os.link(os.path.join(src, "llama", "model.safetensors"),
                    os.path.join(src, "anon", "model.safetensors"))
            with tl.Mount(src) as m:
                names = set(os.listdir(m.path))
                with open(m.join(".castfs", "refused")) as f:
                    # a path may have several (its GGUF file's too)
                    refused = {}
                    for r in json.load(f):
                        if "nf4" in r["views"]:
                            refused[r["path"]] = r
                for name, arch in (("layout",
                                    "LayoutLMForSequenceClassification"),
                                   ("mlm", "BertForMaskedLM"),
                                   ("anon", None)):
                    with self.subTest(model=name):
                        for v in CASTS:
                            self.assertIn("%s.%s" % (name, v), names)
                            self.assertTrue(os.path.exists(m.join(
                                "%s.%s" % (name, v), "config.json")))
                        for v in QUANTISING:
                            self.assertNotIn("%s.%s" % (name, v), names)
                            self.assertFalse(os.path.exists(
                                m.join("%s.%s" % (name, v))))
                        r = refused[name]
                        self.assertIn("nf4", r["views"])
                        self.assertIn("int8", r["views"])
                        self.assertNotIn("bf16", r["views"])
                        self.assertIn(arch or "(none readable)", r["reason"])
                # A checked architecture keeps every view, and no refusal
                # of them.
                for v in CASTS + QUANTISING:
                    self.assertIn("llama.%s" % v, names)
                self.assertNotIn("llama", refused)


class Diffusers(unittest.TestCase):
    """diffusers folders and pipelines under the same gate (stop 42, a bug
    hunt): castfs quantised a UNet's class_embedding (an nn.Embedding when
    num_class_embeds is set, as in the SD x4 upscaler) and DiT's
    class_embedder.embedding_table, which diffusers keeps: the int8 view
    loaded the codes as the table, silently; and inside a pipeline, whose
    components were not gated, a SigLIP image encoder's
    MultiheadAttention out_proj. Quantising views are now offered for the
    diffusers classes checked against diffusers' own quantisation, and a
    pipeline's only when every component's are."""

    def test_unchecked_diffusers_and_pipelines(self):
        import diffusers as D
        torch.manual_seed(3)
        unet = dict(sample_size=8, in_channels=4, out_channels=4,
                    block_out_channels=(32, 64), layers_per_block=1,
                    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                    cross_attention_dim=32, attention_head_dim=8,
                    norm_num_groups=8)
        clip = T.CLIPTextModel(T.CLIPTextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, vocab_size=100,
            max_position_embeddings=16))
        siglip = T.SiglipVisionModel(T.SiglipVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, image_size=16, patch_size=8))
        with tl.tempdir() as src:
            D.UNet2DConditionModel(num_class_embeds=10, **unet).save_pretrained(
                os.path.join(src, "unet_cls"))
            D.DiTTransformer2DModel(
                num_attention_heads=2, attention_head_dim=16, in_channels=4,
                out_channels=8, num_layers=1, sample_size=8, patch_size=2,
                num_embeds_ada_norm=10, norm_num_groups=8).save_pretrained(
                os.path.join(src, "dit"))
            D.UNet2DConditionModel(**unet).save_pretrained(
                os.path.join(src, "unet"))
            for pipe, comps in (("pipe_ok", {"unet": None,
                                             "text_encoder": clip}),
                                ("pipe_siglip", {"unet": None,
                                                 "image_encoder": siglip})):
                for c, mdl in comps.items():
                    d = os.path.join(src, pipe, c)
                    if mdl is None:
                        D.UNet2DConditionModel(**unet).save_pretrained(d)
                    else:
                        mdl.save_pretrained(d)
                with open(os.path.join(src, pipe, "model_index.json"),
                          "w") as f:
                    json.dump({"_class_name": "StableDiffusionPipeline",
                               "_diffusers_version": D.__version__}, f)
            with tl.Mount(src) as m:
                names = set(os.listdir(m.path))
                with open(m.join(".castfs", "refused")) as f:
                    refused = {r["path"]: r for r in json.load(f)
                               if "nf4" in r["views"]}
                for name, why in (("unet_cls", "with num_class_embeds"),
                                  ("dit", "DiTTransformer2DModel"),
                                  ("pipe_siglip", "component image_encoder"
                                   ": config.json: architectures "
                                   "'SiglipVisionModel'")):
                    with self.subTest(model=name):
                        for v in CASTS:
                            self.assertIn("%s.%s" % (name, v), names)
                        for v in QUANTISING:
                            self.assertFalse(os.path.exists(
                                m.join("%s.%s" % (name, v))), (name, v))
                        self.assertIn(why, refused[name]["reason"])
                # Checked classes, and a pipeline of them, keep every view.
                for name in ("unet", "pipe_ok"):
                    for v in CASTS + QUANTISING:
                        self.assertIn("%s.%s" % (name, v), names)
                    self.assertNotIn(name, refused)
                self.assertTrue(os.path.exists(
                    m.join("pipe_ok.nf4", "text_encoder", "config.json")))


if __name__ == "__main__":
    tl.main()
