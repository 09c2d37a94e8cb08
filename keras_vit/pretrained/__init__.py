"""Pretrained weights from other ecosystems: file readers (`readers`:
safetensors, npz), the timm / Hugging Face / big_vision layouts (`layouts`,
`timm`, `timm_eva`, `huggingface` for ViT / DeiT, `hf_dinov2` and `hf_clip`
for transformers' DINOv2, DINOv3, SigLIP and CLIP, `big_vision`),
architecture detection (`detect`) and conversion into keras_vit models
(`convert.convert_checkpoint`)."""
