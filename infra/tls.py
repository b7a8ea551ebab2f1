"""The TLS material of a secured local stack: a CA of its own and the brokers' certificate.

Clients verify the broker's certificate and its host name (librdkafka does by default), so a
secured stack needs a certificate for 127.0.0.1/localhost signed by a CA the clients are told
to trust (`ssl.ca.location`). Both are made once per stack and reused. The CA's key is dropped
as soon as it has signed the broker's certificate: nothing can then sign another certificate
that the stack's clients would accept. Everything is PEM, the form librdkafka reads and Kafka
reads with `ssl.keystore.type=PEM` / `ssl.truststore.type=PEM`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from host.files import write_private

VALID_DAYS = 3650  # a local stack's certificates should not expire under it


@dataclass(frozen=True)
class TlsFiles:
    """Where a stack's TLS material is."""

    directory: Path

    @property
    def ca(self) -> Path:
        """The CA certificate: clients' `ssl.ca.location`, the brokers' truststore."""
        return self.directory / "ca.pem"

    @property
    def keystore(self) -> Path:
        """The broker's private key followed by its certificate chain (owner-only)."""
        return self.directory / "broker.pem"


def ensure(directory: Path) -> TlsFiles:
    """The stack's TLS files, created on first use."""
    files = TlsFiles(directory)
    if files.ca.exists() and files.keystore.exists():
        return files
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate(
        _name("local stack CA"), ca_key.public_key(), _name("local stack CA"), ca_key,
        [(x509.BasicConstraints(ca=True, path_length=0), True),
         (x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                        data_encipherment=False, key_agreement=False, key_cert_sign=True,
                        crl_sign=True, encipher_only=False, decipher_only=False), True)])
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker_cert = _certificate(
        _name("localhost"), broker_key.public_key(), ca_cert.subject, ca_key,
        [(x509.BasicConstraints(ca=False, path_length=None), True),
         (x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False),
         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
         (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)])
    key_pem = broker_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (broker_cert, ca_cert))
    write_private(files.keystore, (key_pem + chain).decode())
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return files


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name,
                 signing_key: ec.EllipticCurvePrivateKey,
                 extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())
