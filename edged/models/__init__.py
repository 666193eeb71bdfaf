"""The model repository: each model's folder and manifest, its variants, and which
TensorRT engine this GPU may load.
"""
