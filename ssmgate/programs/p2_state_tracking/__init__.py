"""p2_state_tracking"""
