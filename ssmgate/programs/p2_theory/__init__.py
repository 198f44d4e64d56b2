"""p2_theory"""
