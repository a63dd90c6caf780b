"""Tests of the Lambda Cloud adapter (providers/lambda): parsing and error tables, every
primitive over respx, hostile answers, the vendor OpenAPI contract, and a whole job."""
