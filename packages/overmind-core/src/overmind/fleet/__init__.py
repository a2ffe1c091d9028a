"""The fleet: nodes sharing cache entries through a store (S3-compatible or a shared directory).

An entry travels as content-addressed blobs (``blobs/sha256/<hex>``) and one signed manifest per portable key
(``refs/<key>``), written last, so a reader sees an entry whole or not at all. :mod:`.config` reads the settings,
:mod:`.stores` opens a store by its URL, :mod:`.manifest` signs and verifies, :mod:`.transfer` uploads from fds
and downloads into sealed memfds, :mod:`.oci` exports an OCI image layout that is also a ``file://`` store.
Nothing here imports boto3 until an ``s3://`` store is opened.
"""
