package posenc;

/** An error answer of the service: HTTP status plus the {@code {"error", "type"}} envelope. */
public class PosencException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int status;
    private final String type;
    private final String serviceMessage;

    public PosencException(int status, String type, String serviceMessage) {
        super("HTTP " + status + " (" + type + "): " + serviceMessage);
        this.status = status;
        this.type = type;
        this.serviceMessage = serviceMessage;
    }

    public int status() {
        return status;
    }

    /** The envelope's short code (e.g. "invalid_parameter"); empty when the body was not the envelope. */
    public String type() {
        return type;
    }

    /** The service's message, naming what was wrong and what is allowed. */
    public String serviceMessage() {
        return serviceMessage;
    }
}
