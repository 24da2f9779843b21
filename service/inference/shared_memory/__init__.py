"""inference/shared_memory"""
