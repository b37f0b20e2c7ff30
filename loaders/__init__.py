"""mmfeed.loaders"""
