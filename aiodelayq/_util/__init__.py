"""What every layer uses: owned background tasks (``tasks``), every check of user-given numbers
(``checks``), whether a moment of the loop's clock has come (``clock``), the metrics hook
(``observe``), spans (``tracing``), ASGI answers (``asgi``) and URL redaction (``urls``). Imports
nothing of the package but ``exceptions``."""
