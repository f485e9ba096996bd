"""frame"""
