"""What a miss's loader did besides returning, recorded on the miss and done again on a hit: its warnings and its log
records.
"""
