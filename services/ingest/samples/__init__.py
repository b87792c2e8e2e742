"""The sample store: listing, counts for the platform's services, feedback, shadow pairs."""
