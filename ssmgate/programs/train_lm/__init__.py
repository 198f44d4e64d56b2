"""train_lm"""
