"""`rlkube-trainer fetch`: a job's model or data (model.uri, data.uri) fetched once into the
job's volume before its role pods start.

- source.py: the uri, parsed (s3://bucket/prefix, hf://org/name[@revision]);
- place.py: the staging folder, its rename into place and the marker of what was fetched;
- s3.py and hub.py: listing (what the source holds now) and downloading, per kind of source;
- run.py: the fetch, skipped when the folder already holds what the source holds.
"""
