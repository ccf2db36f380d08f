-- Run once by the MySQL image on first start, after MYSQL_DATABASE and MYSQL_USER exist.
CREATE DATABASE IF NOT EXISTS airuntime_credentials CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_ai_ci;
GRANT ALL PRIVILEGES ON airuntime_credentials.* TO 'airuntime'@'%';
FLUSH PRIVILEGES;
