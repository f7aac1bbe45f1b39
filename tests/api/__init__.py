"""The execution API (`provision api`): its HTTP layer on real servers, and real guests behind it."""
