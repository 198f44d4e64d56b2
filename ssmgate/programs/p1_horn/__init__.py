"""p1_horn"""
