"""The offline build chain: quantize (INT8/FP8 Q/DQ), convert (FP16/BF16) and build
TensorRT engines, each step writing its file into the model's folder and its entry
into the model's manifest. Nothing here runs in the daemon.
"""
