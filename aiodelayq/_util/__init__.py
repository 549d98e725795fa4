"""What every layer uses: owned background tasks (``tasks``), the metrics hook (``observe``), URL redaction
(``urls``). Imports nothing of the package but ``exceptions``."""
