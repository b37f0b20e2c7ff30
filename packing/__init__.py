"""mmfeed.packing"""
