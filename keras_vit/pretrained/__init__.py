"""Pretrained weights from other ecosystems: file readers (`readers`:
safetensors, npz), the timm / Hugging Face / big_vision layouts (`layouts`,
`timm`, `huggingface`, `big_vision`), architecture detection (`detect`) and
conversion into keras_vit models (`convert.convert_checkpoint`)."""
