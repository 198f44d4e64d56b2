"""p1_tools"""
