"""plan (WIP)"""
