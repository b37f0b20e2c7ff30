"""mmfeed.bench"""
