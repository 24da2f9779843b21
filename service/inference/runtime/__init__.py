"""inference/runtime"""
