/** The payment request the executor and TLS tests send: one definition, so they cannot drift. */
export const ENDPOINT = "POST /v1/payments";
export const PAYMENT = {
  method: "POST",
  path: "/v1/payments",
  contentType: "application/json",
  body: '{"amount":4200,"currency":"usd"}',
};
