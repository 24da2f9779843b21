"""inference/codecs"""
