"""mmfeed.codecs"""
