"""An example batch-fetch service on the sift store: a Flask web app (:mod:`fetchapp.web`) that takes and
answers jobs, and runner processes (:mod:`fetchapp.runner`) that fetch their URLs with a stub fetcher
(:mod:`fetchapp.fetcher`)."""
